"""The reference pipeline `fixer`: its spec (`pipeline.toml`, instructions included) and its
output schemas (`schemas`), kept together and apart from the engine, which names none of them."""
