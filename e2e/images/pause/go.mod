module tidalmq.local/e2e/pause

go 1.22
