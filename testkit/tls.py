"""A certificate authority and a server certificate made on the spot, for a TLS redis-server in
tests and benchmarks: what an operator's CA would issue, with openssl (no network)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import ConfigError

VALID_DAYS = 2
"""The certificates are thrown away with the test; a short life keeps a leaked one useless."""


@dataclass(frozen=True)
class TlsFiles:
    """A CA's certificate and a server's certificate and key that the CA signed."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def make_tls_files(folder: Path, *, hosts: Sequence[str] = ("localhost",)) -> TlsFiles:
    """A new CA (in `folder`) and a server certificate it signed, valid for the DNS names or IP
    addresses `hosts` and nothing else."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigError("openssl is not installed: apt-get install openssl")
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_file = folder / "ca.key", folder / "ca.pem"
    key_file, cert_file = folder / "server.key", folder / "server.pem"
    request = folder / "server.csr"
    names = ",".join(f"{'IP' if _is_address(host) else 'DNS'}:{host}" for host in hosts)
    extensions = folder / "server.ext"
    extensions.write_text(
        f"subjectAltName={names}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    days, curve = str(VALID_DAYS), ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    authority = ["-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign"]  # fmt: skip
    run("req", "-x509", *curve, "-nodes", "-keyout", str(ca_key), "-out", str(ca_file),
        "-days", days, "-subj", "/CN=Baton test CA", *authority)  # fmt: skip
    run("req", *curve, "-nodes", "-keyout", str(key_file), "-out", str(request),
        "-subj", f"/CN={hosts[0]}")  # fmt: skip
    run("x509", "-req", "-in", str(request), "-CA", str(ca_file), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert_file), "-days", days,
        "-extfile", str(extensions))  # fmt: skip
    return TlsFiles(ca_file=ca_file, cert_file=cert_file, key_file=key_file)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
