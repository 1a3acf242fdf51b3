//go:build tools

package tools

import _ "github.com/minio/minio"
