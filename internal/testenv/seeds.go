package testenv

import (
	"os"
	"strconv"
)

// EnvPropertySeeds names the variable that makes the randomized property
// tests run more seeds than the suite does (docs/testing.md, "More
// seeds"): a long run's way to look for rare failures.
const EnvPropertySeeds = "METERLINE_PROPERTY_SEEDS"

// PropertySeeds returns how many seeds METERLINE_PROPERTY_SEEDS asks the
// property tests to add to their own, 0 when it is unset or not a
// positive number.
func PropertySeeds() int {
	n, err := strconv.Atoi(os.Getenv(EnvPropertySeeds))
	if err != nil || n < 0 {
		return 0
	}
	return n
}
