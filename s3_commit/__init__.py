"""S3 commit: moves WAL data into S3 objects, reads it back, and owns the object-store
interface. (Arrives with the diskless-storage issue.)
"""
