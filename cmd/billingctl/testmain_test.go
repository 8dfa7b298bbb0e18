package main

import (
	"testing"

	"github.com/tally-billing/tally/internal/tools/testdb"
)

// TestMain lets testdb put each test's database back for the next test.
func TestMain(m *testing.M) { testdb.Main(m) }
