"""Stand-ins for the real endpoints, fed by the simulator: dcgm-exporter /metrics, Cloud
Monitoring ListTimeSeries (gRPC), the libtpu runtime-metrics service (gRPC), kernel logs, the
Cloud TPU API (gRPC), the Compute Engine API (REST) and the GCE metadata server (HTTP).
`fleet.SimEndpoints` wires all of them to a simulated fleet (`fleetpulse serve-sim`)."""
