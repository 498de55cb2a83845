"""The operators layer: the user's contract and running it on one key group.

The operator contract, its plan against the input, key groups, the state codec and the
reserved columns. Nothing here knows Delta, the manifest or the protocol.
"""
