package upstream

import (
	"testing"
	"time"
)

// The reference vector of crates/api/src/token.rs (mints_the_reference_vector): the same key and
// claims must give the same token here, or the router would refuse every request.
func TestScopedTokenMatchesTheReferenceVector(t *testing.T) {
	const want = "v1.eyJucyI6ImRlZmF1bHQiLCJuYW1lIjoibXktc2FuZGJveCIsImV4cCI6MTg5MzQ1NjAwMH0.KA5cuEhiG4A7JuXID1bkRgc7JePtuETL6lrlXBTW0NQ"
	got, err := mintScopedToken([]byte("0123456789abcdef0123456789abcdef"), "default", "my-sandbox", time.Unix(1_893_456_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("minted %s, want %s", got, want)
	}
}
