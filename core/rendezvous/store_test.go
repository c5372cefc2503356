package rendezvous

import "testing"

func TestMissingRanksInRankOrder(t *testing.T) {
	tests := []struct {
		joined []string
		want   string
	}{
		{joined: []string{"a", "", "c"}, want: "[1]"},
		{joined: []string{"", "b", "", "", "", "", "", "", "", "", "", ""}, want: "[0 2 3 4 5 6 7 8 9 10 11]"},
		{joined: []string{"a"}, want: "[]"},
	}
	for _, tt := range tests {
		if got := missingRanks(len(tt.joined), tt.joined); got != tt.want {
			t.Errorf("missingRanks(%q) = %s, want %s", tt.joined, got, tt.want)
		}
	}
}
