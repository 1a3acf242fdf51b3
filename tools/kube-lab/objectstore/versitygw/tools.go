//go:build tools

package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
