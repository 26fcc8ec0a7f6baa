"""`fleetpulse report`: the self-contained HTML report and its inline SVG charts."""
