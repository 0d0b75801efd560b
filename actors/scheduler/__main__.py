from actors.scheduler.actor import SchedulerActor
from kernel.actor import main

main(SchedulerActor)
