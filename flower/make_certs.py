"""Certificates and keys for a Flower deployment on a test network (docs/flower.md, Deployment).

    python flower/make_certs.py --host server.lan --host 192.168.1.10 --nodes 4    # into certificates/

Writes, into --out (default certificates/; existing files are kept unless --force):

    ca.crt, ca.key          a self-signed certificate authority (CA), made here, for a test
                            network: nobody else trusts it, and ca.key can sign anything for
                            your machines; keep it off the network
    server.pem, server.key  the SuperLink's TLS certificate, signed by the CA, for localhost,
                            127.0.0.1, ::1 and every --host; the key stays on the SuperLink machine
    supernode-I, supernode-I.pub
                            with --nodes N (I = 0..N-1): SuperNode I's authentication key pair,
                            ECDSA P-384 in OpenSSH format, as Flower 1.41 takes them: the private
                            key goes to node I only (flower-supernode --auth-supernode-private-key),
                            the public one is registered (flwr supernode register)

The CA certificate goes to every SuperNode (--root-certificates) and to every machine that
submits runs (root-certificates in config.toml). For a network with its own CA, use its
certificates instead. Bad input: one line ``error: ...`` and exit status 2. All or nothing: every file
is made in memory and written as a temporary file (prefix ``.tmp-make-certs-``) in --out (or, for a new --out,
into a temporary folder beside it) before any takes its name, so a write that fails (a full disk, a read-only
folder) is one line and exit status 1 with the files as they were, nothing half-written and no temporary file
left; what a killed earlier run left there is removed.
"""
import argparse
import contextlib
import datetime
import ipaddress
import os
import re
import shutil
import sys
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DNS_NAME = re.compile(r"^(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        fail(message)


def fail(message, status=2):
    """One line and exit status 2 (1: a write that failed); a newline or control character in a name is written
    escaped."""
    message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def san(host):
    """The subject alternative name for a host name or an IP address; ValueError if it is neither."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        if not DNS_NAME.match(host) or host.replace(".", "").isdigit():
            raise ValueError(f"--host {host!r} is neither an IP address nor a host name") from None
        return x509.DNSName(host.rstrip("."))


def certificate(subject, key, issuer, issuer_key, days, ca, names=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False)
               .add_extension(x509.KeyUsage(digital_signature=not ca, key_cert_sign=ca, crl_sign=ca,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True))
    if not ca:
        builder = (builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    return builder.sign(issuer_key, hashes.SHA384())


def pem_key(key, openssh=False):
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.OpenSSH if openssh else serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def node_key_pair(comment):
    """A SuperNode authentication key pair: (OpenSSH private key, OpenSSH public key line)."""
    key = ec.generate_private_key(ec.SECP384R1())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return pem_key(key, openssh=True), public + f" {comment}\n".encode()


def write(path, data, private=False, force=False):
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if force else os.O_EXCL)
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


MAX_NODES = 10000
TEMPORARY = ".tmp-make-certs-"  # this program's temporary files and folders: what a killed run left has it


def remove_leftovers(out):
    """Remove the temporary files in ``out`` and folders beside it that a killed earlier run left."""
    parent = os.path.dirname(os.path.abspath(out))
    for folder in (out, parent):
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(TEMPORARY) and (folder == out or name.startswith(TEMPORARY + "folder-")):
                    path = os.path.join(folder, name)
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


def write_all(out, contents):
    """Write {name: (bytes, private)} into ``out``, all or nothing: a new ``out`` is filled as a temporary folder
    beside it and renamed; in an existing one each file is a temporary file first, then all are renamed."""
    umask = os.umask(0)
    os.umask(umask)
    made, name = [], None
    try:
        if os.path.isdir(out):
            staged = []
            for name, (data, private) in contents.items():
                fd, tmp = tempfile.mkstemp(dir=out, prefix=TEMPORARY)
                made.append(tmp)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, 0o600 if private else 0o644 & ~umask)
                staged.append((tmp, os.path.join(out, name)))
            for tmp, path in staged:
                os.replace(tmp, path)
            made = []
            return
        folder = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(out)), prefix=TEMPORARY + "folder-")
        made.append(folder)
        os.chmod(folder, 0o777 & ~umask)
        for name, (data, private) in contents.items():
            with os.fdopen(os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                   0o600 if private else 0o644), "wb") as f:
                f.write(data)
        name = None
        os.rename(folder, out)  # a folder made meanwhile in its place: the rename fails, nothing is moved into it
        made = []
    except OSError as e:  # named by the file it was to be, not its temporary name
        raise OSError(e.errno, e.strerror or str(e), os.path.join(out, name) if name else out) from None
    finally:
        for path in made:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                os.remove(path)


def make(out="certificates", hosts=(), nodes=0, days=365, force=False):
    """Write the files above into ``out``; returns {file name: path}. ValueError for bad input or
    files that exist (without ``force``)."""
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
             x509.IPAddress(ipaddress.ip_address("::1"))]
    for name in map(san, hosts):
        names += [name] if name not in names else []
    if nodes < 0 or days < 1:
        raise ValueError("--nodes must be >= 0 and --days >= 1")
    now = datetime.datetime.now(datetime.timezone.utc)
    most = (datetime.datetime(9999, 12, 31, tzinfo=datetime.timezone.utc) - now).days - 1
    if days > most:  # X.509 (GeneralizedTime) and Python's datetime end with the year 9999
        raise ValueError(f"--days {days} would end after the year 9999, where certificate dates end; "
                         f"at most {most} (today)")
    if nodes > MAX_NODES:
        raise ValueError(f"--nodes {nodes} is more than {MAX_NODES} (each is a key pair made one by one)")
    files = ["ca.crt", "ca.key", "server.pem", "server.key"]
    files += [f"supernode-{i}{end}" for i in range(nodes) for end in ("", ".pub")]
    paths = {name: os.path.join(out, name) for name in files}
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"{out} exists and is not a folder")
    remove_leftovers(out)
    existing = [p for p in paths.values() if os.path.lexists(p)]
    if existing and not force:
        raise ValueError(f"{existing[0]} exists; use --force to replace the files in {out}")
    parents, parent = [], os.path.dirname(os.path.abspath(out))
    while not os.path.lexists(parent):  # the folders above a new --out that are made for it, deepest first
        parents.append(parent)
        parent = os.path.dirname(parent)
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedref test CA")])
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedref SuperLink")])
    ca = certificate(ca_name, ca_key, ca_name, ca_key, days, ca=True)
    server = certificate(server_name, server_key, ca_name, ca_key, days, ca=False, names=names)
    contents = {"ca.crt": (ca.public_bytes(serialization.Encoding.PEM), False), "ca.key": (pem_key(ca_key), True),
                "server.pem": (server.public_bytes(serialization.Encoding.PEM), False),
                "server.key": (pem_key(server_key), True)}
    for i in range(nodes):
        private, public = node_key_pair(f"supernode-{i}")
        contents[f"supernode-{i}"], contents[f"supernode-{i}.pub"] = (private, True), (public, False)
    try:
        if parents:
            os.makedirs(parents[0])
        write_all(out, contents)
    except OSError:
        for folder in parents:  # nothing of this run is left
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise
    return paths


def main(argv=None):
    parser = Parser(description="Make a test CA, the SuperLink's TLS certificate and SuperNode key pairs.")
    parser.add_argument("--out", default="certificates", help="folder for the files (default: certificates)")
    parser.add_argument("--host", action="append", default=[], metavar="NAME_OR_IP",
                        help="a name or address the SuperLink is reached by, repeatable "
                             "(default: only localhost, 127.0.0.1, ::1)")
    parser.add_argument("--nodes", type=int, default=0, help="SuperNode key pairs to make (default: 0)")
    parser.add_argument("--days", type=int, default=365, help="validity of the certificates (default: 365)")
    parser.add_argument("--force", action="store_true", help="replace existing files (default: refuse)")
    args = parser.parse_args(argv)
    existed = os.path.isdir(args.out)
    try:
        paths = make(args.out, args.host, args.nodes, args.days, args.force)
    except ValueError as e:
        fail(str(e))
    except OSError as e:  # a full disk, a read-only folder: nothing of this run is left
        kept = f"the files in {args.out} are as they were" if existed else f"{args.out} was not made"
        fail(f"cannot write {e.filename or args.out} ({e.strerror or e}); {kept}", status=1)
    print(f"wrote {len(paths)} files to {args.out}/: {', '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
