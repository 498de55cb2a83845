"""The operator contract, its plan, and running it on one key group as a Spark task.

Also key groups, the state codec and the reserved columns. Nothing here knows Delta, the
manifest or the protocol.
"""
