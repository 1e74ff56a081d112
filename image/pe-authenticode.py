#!/usr/bin/env python3
"""Prints the SHA-256 Authenticode digest of a PE/COFF image (an EFI
application such as a UKI): the digest UEFI firmware measures into PCR 4
as the EV_EFI_BOOT_SERVICES_APPLICATION event when it loads the image.

    image/pe-authenticode.py FILE

The digest follows the "Windows Authenticode Portable Executable Signature
Format": the headers without the CheckSum field and the certificate table
directory entry, then every section's raw data in file order, then any
data after the last section except the attribute certificate table.
image/build-measured.sh uses it to predict PCR 4; it needs only Python's
standard library.
"""
import hashlib
import struct
import sys


def authenticode(data: bytes) -> str:
    if data[:2] != b"MZ":
        raise ValueError("not a PE image (no MZ header)")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe:pe + 4] != b"PE\0\0":
        raise ValueError("not a PE image (no PE signature)")
    coff = pe + 4
    nsections = struct.unpack_from("<H", data, coff + 2)[0]
    opt_size = struct.unpack_from("<H", data, coff + 16)[0]
    opt = coff + 20
    magic = struct.unpack_from("<H", data, opt)[0]
    if magic == 0x20B:  # PE32+
        dirs = opt + 112
        nrva = struct.unpack_from("<I", data, opt + 108)[0]
    elif magic == 0x10B:  # PE32
        dirs = opt + 96
        nrva = struct.unpack_from("<I", data, opt + 92)[0]
    else:
        raise ValueError("unknown optional header magic %#x" % magic)
    checksum = opt + 64
    size_of_headers = struct.unpack_from("<I", data, opt + 60)[0]
    cert_entry = dirs + 8 * 4  # IMAGE_DIRECTORY_ENTRY_SECURITY
    cert_off, cert_size = (0, 0)
    if nrva > 4:
        cert_off, cert_size = struct.unpack_from("<II", data, cert_entry)

    h = hashlib.sha256()
    h.update(data[:checksum])
    if nrva > 4:
        h.update(data[checksum + 4:cert_entry])
        h.update(data[cert_entry + 8:size_of_headers])
    else:
        h.update(data[checksum + 4:size_of_headers])
    hashed = size_of_headers
    sections = []
    table = opt + opt_size
    for i in range(nsections):
        s = table + 40 * i
        raw_size, raw_ptr = struct.unpack_from("<II", data, s + 16)
        if raw_size:
            sections.append((raw_ptr, raw_size))
    for raw_ptr, raw_size in sorted(sections):
        h.update(data[raw_ptr:raw_ptr + raw_size])
        hashed += raw_size
    end = len(data) - cert_size if cert_size and cert_off + cert_size == len(data) else len(data)
    if end > hashed:
        h.update(data[hashed:end])
    return h.hexdigest()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: pe-authenticode.py FILE", file=sys.stderr)
        return 2
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    try:
        print(authenticode(data))
    except (ValueError, struct.error) as e:
        print("pe-authenticode.py: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
