"""The pure decisions: health transitions, remediation policy, the fleet guard, alert building."""
