from actors.cache_tier.actor import CacheTierActor
from kernel.actor import main

main(CacheTierActor)
