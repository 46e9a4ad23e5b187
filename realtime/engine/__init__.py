"""The engine core: one thread stepping every utterance through the model, fed by typed
commands and heard through events. It never imports the network edge around it."""
