package aggregator

// setFinalChunk sets the FINAL chunk of cfg (a function of its own, so that
// the chunk tests can run against a version without the setting).
func setFinalChunk(cfg *Config, n int) { cfg.FinalChunk = n }
