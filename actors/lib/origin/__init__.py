"""The origin of a request: a library that the frontdoor (HTTP) and the gateway (bus clients) share,
not an actor. It keeps the record of every request it takes and follows it downstream through the
tokenizer, scheduler and executor, resubmitting it when one of them dies."""
