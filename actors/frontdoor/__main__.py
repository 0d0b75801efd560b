from actors.frontdoor.actor import FrontdoorActor
from kernel.actor import main

main(FrontdoorActor)
