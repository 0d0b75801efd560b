from actors.executor.actor import ExecutorActor
from kernel.actor import main

main(ExecutorActor)
