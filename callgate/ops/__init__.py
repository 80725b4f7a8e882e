"""Running callgate: the CLI, the embedded services, process supervision and the demo."""
