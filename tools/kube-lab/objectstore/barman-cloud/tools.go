//go:build tools

package tools

import _ "github.com/cloudnative-pg/plugin-barman-cloud/cmd/manager"
