package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPyRepr(t *testing.T) {
	assert.Equal(t, `'goddp 1 abi 9'`, pyRepr("goddp 1 abi 9"))
	assert.Equal(t, `"it's"`, pyRepr("it's"))
	assert.Equal(t, `'both \' and "'`, pyRepr(`both ' and "`))
	assert.Equal(t, `'a\\b\n'`, pyRepr("a\\b\n"))
	// What CPython 3.11's repr() printed for each (non-printable runes are
	// escaped by size, printable ones kept).
	for in, want := range map[string]string{
		"\u0085": `'\x85'`, "\u200b": `'\u200b'`, "\u00a0": `'\xa0'`, "\U000e0001": `'\U000e0001'`,
		"é": `'é'`, "日本": `'日本'`, "\u2028": `'\u2028'`, "\x7f": `'\x7f'`, "a\u00adb": `'a\xadb'`,
	} {
		assert.Equal(t, want, pyRepr(in), "%q", in)
	}
}
