package ledger

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

// nullString is s, or nil (SQL NULL) when empty.
func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nullInt is n, or nil (SQL NULL) when zero.
func nullInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}
