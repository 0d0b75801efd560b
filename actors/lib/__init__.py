"""Libraries that several actors share. Nothing here is an actor or runs on its own: each package
is code that an actor's process imports (the origin: the frontdoor and the gateway)."""
