"""The tools a stage's model calls, and the workspace they work in.

`workspace` defines the interface the tools need (`Workspace`) and its implementation on a local
git working copy; `code` builds the model-facing tool functions over one workspace; `artifacts`
is where tools put what is too big for a prompt.
"""
