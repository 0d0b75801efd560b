from actors.weight_sync.actor import WeightSyncActor
from kernel.actor import main

main(WeightSyncActor)
