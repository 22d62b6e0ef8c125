"""MurmurHash3's fmix64 on Python ints: the reference of the hash that places dynamic-table keys on shards
(test_front_sharding.py) and picks a key's Bloom counters (test_lifecycle.py)."""

MASK = (1 << 64) - 1


def fmix64(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)
