"""CUDA architectures compiled into a shared library, read from its ELF `.nv_fatbin` section.

A fat binary holds one entry per architecture: a SASS cubin (`sm_90`) or PTX (`compute_90`).
Only the uncompressed entry headers are read, so this works without the CUDA toolkit and
with compressed payloads.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, List, Optional

_FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX, _KIND_CUBIN = 1, 2


def _fatbin_section(f: BinaryIO) -> Optional[bytes]:
    """Bytes of the `.nv_fatbin` section of a 64-bit little-endian ELF file, if any."""
    ident = f.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", ident, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    # (name offset, type, flags, addr, file offset, size)
    names_off, names_size = sections[shstrndx][4], sections[shstrndx][5]
    f.seek(names_off)
    names = f.read(names_size)
    for name_off, _type, _flags, _addr, offset, size in sections:
        if names[name_off:names.index(b"\0", name_off)] == b".nv_fatbin":
            f.seek(offset)
            return f.read(size)
    return None


def _entries(blob: bytes) -> List[str]:
    archs = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != _FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned inside the section
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 32 <= end:
            kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", blob, entry)
            arch = struct.unpack_from("<I", blob, entry + 28)[0]
            if kind == _KIND_CUBIN:
                archs.append(f"sm_{arch}")
            elif kind == _KIND_PTX:
                archs.append(f"compute_{arch}")
            if entry_header == 0:
                break
            entry += entry_header + payload
        pos = max(end, pos + 8)
    return archs


def cuda_archs(path: str) -> Optional[List[str]]:
    """Sorted distinct `sm_XX` / `compute_XX` entries of the library, or None if unreadable."""
    try:
        with open(path, "rb") as f:
            blob = _fatbin_section(f)
    except (OSError, struct.error, ValueError, IndexError):
        return None
    if blob is None:
        return None
    key = lambda a: (int(a.split("_")[1]), a.startswith("compute"))
    return sorted(set(_entries(blob)), key=key)
