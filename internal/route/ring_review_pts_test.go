package route

import "testing"

func TestRingReviewPoints(t *testing.T) {
	r, err := NewRing([]int{0, 1}, RingConfig{Hash: "md5", Names: []string{"a:1", "b:2"}, Weights: []int{1, 100}})
	if err != nil {
		t.Fatal(err)
	}
	n := map[int]int{}
	for _, p := range r.points {
		n[p.up]++
	}
	t.Logf("points per upstream %v, Upstreams %v", n, r.Upstreams())
}

func BenchmarkRingReviewPick(b *testing.B) {
	names := []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379", "10.0.0.4:6379"}
	for _, h := range HashNames() {
		for _, d := range []string{"ketama", "modula"} {
			r, err := NewRing([]int{0, 1, 2, 3}, RingConfig{Hash: h, Distribution: d, HashTag: "{}", Names: names})
			if err != nil {
				b.Fatal(err)
			}
			key := []byte("user:{12345}:profile:settings")
			b.Run(h+"/"+d, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = r.Pick(key)
				}
			})
		}
	}
}

// TestRingReviewOrderDoesNotMatter: the README says the order of
// upstreams does not matter; the same servers listed in reverse must
// place every key the same.
func TestRingReviewOrderDoesNotMatter(t *testing.T) {
	names := []string{"10.0.0.1:6379", "10.0.0.22:6379", "a", "shard-three", "10.0.0.3:6380"}
	weights := []int{3, 1, 7, 2, 5}
	for _, d := range []string{"ketama", "modula"} {
		for _, w := range [][]int{nil, weights} {
			a, err := NewRing([]int{0, 1, 2, 3, 4}, RingConfig{Distribution: d, Hash: "md5", Names: names, Weights: w})
			if err != nil {
				t.Fatal(err)
			}
			rn, rw := make([]string, 5), []int(nil)
			if w != nil {
				rw = make([]int, 5)
			}
			for i := range 5 {
				rn[i] = names[4-i]
				if w != nil {
					rw[i] = w[4-i]
				}
			}
			b, err := NewRing([]int{4, 3, 2, 1, 0}, RingConfig{Distribution: d, Hash: "md5", Names: rn, Weights: rw})
			if err != nil {
				t.Fatal(err)
			}
			diff := 0
			for i := range 5000 {
				k := []byte("key:" + string(rune('a'+i%26)) + ":" + itoa(i))
				if a.Pick(k) != b.Pick(k) {
					diff++
				}
			}
			if diff > 0 {
				t.Errorf("%s weights %v: %d of 5000 keys placed differently in reversed order", d, w, diff)
			}
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}
