"""The trusted side: the only code that opens the private data.

Nothing in the kernel process imports this package.
"""
