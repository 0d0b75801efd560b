from actors.tokenizer.actor import TokenizerActor
from kernel.actor import main

main(TokenizerActor)
