module github.com/qftrio/qftrio/sdk/go

go 1.22
