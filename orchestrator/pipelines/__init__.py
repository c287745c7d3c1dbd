"""The built-in pipelines, one folder each (`<name>/pipeline.toml` and its schemas module), and
`schemas`: output schemas any pipeline may use."""
