"""What clients store on the server and find again later: stored responses, and the Batch API's files and batches."""
