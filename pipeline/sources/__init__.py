"""Ingest adapters: each a pure parser plus a small I/O loop (base.run_source) with
checkpointing and backoff, publishing to Kafka (publish.KafkaPublisher).

    prometheus   DCGM metrics via Prometheus (prometheus-api-client) → GpuSample
    cloudmon     Cloud TPU metrics via Cloud Monitoring (MetricServiceClient) → TpuSample
    tpu_runtime  libtpu runtime metrics (gRPC, on the host) → TpuSample, IciSample
    xid          NVRM Xid lines of the kernel log, across rotations → XidEvent
"""
