from actors.snapshot.actor import SnapshotActor
from kernel.actor import main

main(SnapshotActor)
