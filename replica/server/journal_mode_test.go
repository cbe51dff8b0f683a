package server

import "os"

// CATENA_TEST_JOURNAL=1 runs every test of the package with the replicas
// keeping a journal (Options.Journal).
func init() { journalByDefault = os.Getenv("CATENA_TEST_JOURNAL") == "1" }
