"""Running callgate: the CLI, the embedded services, process supervision and the demo."""

# The checkout's top-level ops/ is a link to this folder, kept for readers. Imported through
# it, every module would load a second time under another name, with its own exception
# classes, so the second path is refused.
if __name__ != "callgate.ops":
    raise ImportError(
        "import callgate.ops, not ops: the checkout's ops/ is a link kept for readers"
    )
