"""Stand-ins for the real endpoints, fed by the simulator: dcgm-exporter /metrics, Cloud
Monitoring ListTimeSeries (gRPC), the libtpu runtime-metrics service (gRPC) and kernel logs.
`fleet.SimEndpoints` wires all of them to a simulated fleet (`fleetpulse serve-sim`)."""
