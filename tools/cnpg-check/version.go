package main

// apiVersion is the github.com/cloudnative-pg/api version in go.mod, printed so reports name what was checked.
const apiVersion = "v1.29.0"
