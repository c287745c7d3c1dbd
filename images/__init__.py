"""Baton's service images, built on the host without a registry (`make images`).

`images.base` makes `baton-base`, a minimal Debian root file system imported with
`docker import` (as `sandbox.image` does for the sandbox); `images.build` prepares wheels on the
host and builds `baton:<version>` from `images/Dockerfile` on top of it. `compose.yaml` runs
both; `images/README.md` says how, and what the Docker socket mounted into the code stages
means.
"""
