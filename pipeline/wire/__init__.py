"""The wire: value codec, topic specs, Kafka clients and admin, CloudEvents headers, ACLs, edge."""
