module tidalmq.local/e2e/runc-nocap

go 1.22
