"""Competing RQ workers: gate, CAS reservation with lease and fence, handler, completion."""

# The checkout's top-level worker/ is a link to this folder, kept for readers. Imported through
# it, every module would load a second time under another name, with its own exception
# classes, so the second path is refused.
if __name__ != "callgate.worker":
    raise ImportError(
        "import callgate.worker, not worker: the checkout's worker/ is a link kept for readers"
    )
