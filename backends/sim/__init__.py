"""A simulated SGLang server: SGLang's HTTP contract with a calibrated continuous-batching timing model."""
