//go:build goddp_testhooks

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCTextKeepsEveryByteBeyondANul(t *testing.T) {
	assert.Equal(t, `layer\x00.weight: too big`, cText("layer\x00.weight: too big"))
	assert.Equal(t, "plain text", cText("plain text"))
	assert.Equal(t, `\x00\x00`, cText("\x00\x00"))
}
