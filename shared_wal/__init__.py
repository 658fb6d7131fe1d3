"""The shared write-ahead log: per-writer segment files on a pyfilesystem2 FS,
group-committed appends, crash recovery with torn-tail truncation, and tailing readers.
"""
