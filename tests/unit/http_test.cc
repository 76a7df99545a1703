// Filled in by the module's tests.
