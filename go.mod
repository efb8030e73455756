module github.com/goddp/goddp

go 1.26
