"""Installing a snapshot as a root's next epoch: the restore epoch, migration, copies, recovery.

Rollbacks, restores, migrations and job decisions all end here: a PREPARED restore epoch
that rewrites the state tables and back-edge logs, restores the sinks and rewinds the
sources, committed by the next start's recovery.
"""
