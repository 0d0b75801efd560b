from actors.gateway.actor import GatewayActor
from kernel.actor import main

main(GatewayActor)
