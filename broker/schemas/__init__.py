"""The schema registry, Pulsar's compatibility strategies and the Avro resolution rules."""
