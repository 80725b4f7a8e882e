"""Redis as transport: the RQ queue, its keys and the scripts that read them."""
