package tokens

// LoRAExtra returns the extra bytes mixed into every block key of a request
// served with the LoRA adapter name ("" for the base model: nil). The KV
// event subscriber uses the same function with each BlockStored's
// lora_name, so router-side and event-side keys agree.
func LoRAExtra(name string) []byte {
	if name == "" {
		return nil
	}
	return append([]byte("lora:"), name...)
}
