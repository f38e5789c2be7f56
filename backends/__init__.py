"""What sits behind the gateway: the SGLang launch plan, the process supervisor and the simulator."""
